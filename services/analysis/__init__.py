"""Analysis service: contrastive capability analysis of stored trajectories."""
