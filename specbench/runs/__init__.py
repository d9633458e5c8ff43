"""Run bookkeeping: the runner, the run identity, results folders, provenance, merging shards, SLURM and wandb."""
