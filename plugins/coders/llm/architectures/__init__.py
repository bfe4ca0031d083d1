"""Published model architectures (a hub model's ``config.json`` numbers) the embedded build can initialise at
random, paired with the embedded tokenizer: ``coder.embedded.architecture=<file name without .json>``."""
