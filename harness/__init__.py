"""The harness: runs, refusals, provenance, goldens, reports and CI helpers around the recipes in ``recipes/``."""
