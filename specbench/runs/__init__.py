"""Run bookkeeping: the runner, results folders, provenance, merging shards, SLURM and wandb."""
