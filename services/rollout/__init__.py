"""Rollout service: agents playing environment tasks; trajectories to the artifact store."""
