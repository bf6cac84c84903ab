"""clap: governed, data-versioned post-training of domain agents.

The library holds all logic as plain functions; the scripts in ``stages/`` are thin
wrappers that parse paths, load their params section, call the library, validate with
the schemas and write outputs atomically.
"""

__version__ = "0.1.0"
