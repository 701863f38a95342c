-- wrk script: POST the file named by BENCH_BODY with BENCH_CONTENT_TYPE, then print one JSON line.
wrk.method = "POST"
wrk.headers["Content-Type"] = os.getenv("BENCH_CONTENT_TYPE") or "application/octet-stream"
local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
wrk.body = f:read("*a")
f:close()

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"p50_us":%.0f,"p90_us":%.0f,"p99_us":%.0f,"mean_us":%.1f,' ..
    '"max_us":%.0f}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean,
    latency.max))
end
