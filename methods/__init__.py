"""A method's parts, one file each (policies, drafters, shapes, rules, loops), registered under their config names in
specbench.decoding's registries (POLICIES, DRAFTERS, SHAPES, RULES, LOOPS).

Every module here is imported on the first registry lookup: a new part is one file here, a new method one YAML in
conf/method/ naming its parts.
"""
