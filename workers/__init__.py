"""Worker-side processes: the simulated engine, the real-vLLM launcher and the registration agent."""
