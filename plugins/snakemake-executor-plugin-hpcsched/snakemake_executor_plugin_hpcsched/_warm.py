"""Imported by the forkserver of :mod:`.preloaded` alone, before its first fork: what
every Snakemake job would otherwise load for itself. Building the argument parser is
when Snakemake discovers its plugins (its plugin registries keep what they found), and
``smart_open`` is what it imports to open the Snakefile. A failure here costs only the
head start: each job then does this work itself and meets the error there."""

import snakemake.cli

try:
    import smart_open  # noqa: F401

    snakemake.cli.get_argument_parser()
except Exception:  # noqa: BLE001, S110 - see the docstring
    pass
