"""Pure-Python routing core: block keys, the prefix index, KV-event decoding, load, policies.

Nothing here imports Django, channels, celery, redis, httpx or zmq (an import-linter
contract in pyproject.toml enforces it). Time and randomness are always passed in.
"""
