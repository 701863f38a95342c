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

  // Streams the reply to `messages`; onToken(text) per piece; resolves to the whole reply.
  async function stream(url, headers, model, messages, onToken) {
    const response = await fetch(url, {
      method: "POST",
      headers: { ...headers, "content-type": "application/json", accept: "text/event-stream" },
      body: JSON.stringify({ model, messages, stream: true }),
    });
    if (!response.ok) throw new Error(`${response.status} ${await response.text()}`);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let whole = "", done = false;
    const feed = sseReader((data) => {
      const piece = deltaText(data);
      if (piece === null) { done = true; return; }
      if (piece) { whole += piece; onToken(piece); }
    });
    while (!done) {
      const { value, done: ended } = await reader.read();
      if (ended) break;
      feed(decoder.decode(value, { stream: true }));
    }
    return whole;
  }

  window.LanternChat = { sseReader, deltaText, stream };
})();
