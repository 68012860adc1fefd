"""The wire: HTTP/1.1 exchanges with bounds on everything a server sends (`http1`), server-sent events (`sse`), the
OpenAI-style chunks they carry (`chunks`), and where each server family counts tokens (`tokenize`). Used by bench's
client, verify, the calibration server and the engine adapters; it imports nothing else of servelab's but `errors`
and `records`, so every layer above may use it."""
