"""SLM Lab: a spec-driven deep reinforcement learning lab."""

__version__ = '0.1.0'
