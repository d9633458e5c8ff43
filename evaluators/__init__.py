"""Benchmarks, one file each, registered in `specbench.data.dataset.DATASETS` under their config name.

Every module here is imported on the first registry lookup: a new benchmark is one file here plus one YAML in conf/dataset/.
"""
