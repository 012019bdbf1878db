"""Example jobs for ``chaos run -- COMMAND``: plain scripts, careless and careful variants."""
