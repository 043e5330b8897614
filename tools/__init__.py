"""Offline tools that make what the suite ships (never imported by a run): `tools.micro` generates the micro
world's data (`python -m tools.micro.world`) and pretrains the micro backbone (`python -m tools.micro.pretrain`)."""
