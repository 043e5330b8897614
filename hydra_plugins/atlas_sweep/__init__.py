"""Hydra launchers of the ATLAS suite: re-runnable sweeps, locally and on SLURM (hydra_plugins/atlas_sweep/planner.py)."""
