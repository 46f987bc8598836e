"""The routing gateway: OpenAI-compatible, KV-cache-aware, explainable (the data plane).

Modules, from the edge inwards:

- `routing` - the channels HTTP routes (`http_urlpatterns`, mounted by `controlplane.asgi`),
  the one `GatewayHandle` the product app holds (`gateway`), `gateway_app(handle)` for a
  standalone app, and the ASGI lifespan that starts/stops the gateway state.
- `consumers` - `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`,
  `GET /gateway/metrics`, `GET /gateway/health`; API keys, body limit, validation, records.
- `validation`, `errors` - request parsing; OpenAI-shaped error bodies.
- `state` - the composition root (`build_gateway_state`) and the per-request routing step.
- `proxy`, `transport`, `breaker` - upstream call with retries before the first byte, SSE
  pass-through, per-worker circuit breakers, the lean keep-alive HTTP/1.1 transport.
- `snapshot` - the control plane's routing snapshot as values, its sources (static, HTTP,
  in-process) and the refresher (change notices + polling).
- `kv_events`, `scraper`, `tokenization` - live cache state (ZMQ KV events, replay, fallback),
  live load (vLLM `/metrics`), tokenizer adapters (builtin, hf, remote, text).
- `records`, `metrics` - per-request records (Redis stream or in-memory ring) and the
  gateway's Prometheus metrics.
- `serve` - run an ASGI app (by default the whole product) with uvicorn in this process.
- `config` - every setting, from the environment.
"""
