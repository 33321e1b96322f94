"""An experiment's configuration, from its file to the frozen Experiment every part reads: where experiment
files are found (files.py), how one is loaded with its bases and the command line's overrides (loading.py), the
rules across its fields (validation.py), the values derived from others (derivation.py) and the site values a
new cluster sets (site_values.py). The fields themselves are bigscience_ops/schema.py's, read by
bigscience_ops/typedyaml.py: both stand below this package, as every part of bsops reads them."""
