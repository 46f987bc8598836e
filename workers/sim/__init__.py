"""Simulated vLLM engine: step model (engine.py), profiles, ASGI server, KV-event publisher."""
