"""Decoding methods, one file each, registered in `specbench.decoding.method.METHODS` under their config name.

Every module here is imported on the first registry lookup: a new method is one file here plus one YAML in conf/method/.
"""
