"""Faults as records (what failed, how it was handled) and as seen from inside an actor (injected ones, preemption notices)."""
