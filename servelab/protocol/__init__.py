"""The wire: HTTP/1.1 exchanges with bounds on everything a server sends (`http1`), server-sent events (`sse`), and
the OpenAI-style chunks they carry (`chunks`). Used by bench's client, verify and the calibration server; it
imports nothing else of servelab's but `errors` and `records`, so every layer above may use it."""
