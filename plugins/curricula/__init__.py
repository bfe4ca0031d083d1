"""Built-in KernelZero plugins, registered through the same hooks a third-party package uses."""
