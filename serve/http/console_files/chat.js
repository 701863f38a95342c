"use strict";
// The chat box: OpenAI-style `POST /v1/chat/completions` with `stream: true`, read as SSE.
(function () {
  // Feed SSE text in chunks; calls onData(payload) for each complete `data:` event.
  function sseReader(onData) {
    let buffer = "";
    return function feed(chunk) {
      buffer += chunk;
      let cut;
      while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
        const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
        if (data) onData(data);
      }
    };
  }

  // The text a chat.completion.chunk adds (choices[0].delta.content), or "" for none.
  function deltaText(payload) {
    if (payload === "[DONE]") return null;
    const chunk = JSON.parse(payload);
    const choice = (chunk.choices || [])[0] || {};
    return (choice.delta && choice.delta.content) || choice.text || "";
  }

  // The completion tokens a chunk's usage counts (the last chunk, with include_usage), or null.
  function usageTokens(payload) {
    if (payload === "[DONE]") return null;
    const usage = JSON.parse(payload).usage;
    return usage && Number.isInteger(usage.completion_tokens) ? usage.completion_tokens : null;
  }

  // Why the answer ended ("stop", "length"), from the chunk that says so, or null.
  function finishReason(payload) {
    if (payload === "[DONE]") return null;
    const choice = (JSON.parse(payload).choices || [])[0] || {};
    return choice.finish_reason || null;
  }

  // "TTFT 120 ms · 42 tokens · 31.5 tokens/s · finish: stop": time to the first token, and the tokens after it
  // over the time they took (the first token's wait is TTFT's, not the rate's).
  function statsLine(stats) {
    const parts = [];
    if (stats.ttftMs !== null) parts.push(`TTFT ${Math.round(stats.ttftMs)} ms`);
    if (stats.tokens !== null) {
      parts.push(`${stats.tokens} tokens`);
      const seconds = (stats.endMs - stats.firstMs) / 1000;
      if (stats.tokens > 1 && seconds > 0) parts.push(`${((stats.tokens - 1) / seconds).toFixed(1)} tokens/s`);
    }
    if (stats.finish) parts.push(`finish: ${stats.finish}`);
    return parts.join(" · ");
  }

  // Streams the reply to `messages`; onToken(text) per piece; resolves to the whole reply and
  // its timings: { whole, tokens, finish, ttftMs, firstMs, endMs } (tokens from the usage chunk).
  async function stream(url, headers, model, messages, onToken) {
    const started = performance.now();
    const response = await fetch(url, {
      method: "POST",
      headers: { ...headers, "content-type": "application/json", accept: "text/event-stream" },
      body: JSON.stringify({ model, messages, stream: true, stream_options: { include_usage: true } }),
    });
    if (!response.ok) throw new Error(`${response.status} ${await response.text()}`);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let whole = "", done = false, tokens = null, firstMs = null, finish = null;
    const feed = sseReader((data) => {
      const piece = deltaText(data);
      if (piece === null) { done = true; return; }
      tokens = usageTokens(data) ?? tokens;
      finish = finishReason(data) ?? finish;
      if (piece) {
        if (firstMs === null) firstMs = performance.now();
        whole += piece;
        onToken(piece);
      }
    });
    while (!done) {
      const { value, done: ended } = await reader.read();
      if (ended) break;
      feed(decoder.decode(value, { stream: true }));
    }
    const endMs = performance.now();
    return { whole, tokens, finish, firstMs, endMs, ttftMs: firstMs === null ? null : firstMs - started };
  }

  window.LanternChat = { sseReader, deltaText, usageTokens, finishReason, statsLine, stream };
})();
