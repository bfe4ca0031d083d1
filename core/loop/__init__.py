"""Self-play and training: the data flow from proposer to coder update, phases, rewards, metrics."""
