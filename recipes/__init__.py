"""qwen3-trn-repro recipes: the tutorial's three torchtitan configs, one launch path, two tiers."""
