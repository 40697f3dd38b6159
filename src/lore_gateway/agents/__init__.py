"""What lore knows about each agent's configuration: where it lives, how to point
the agent at the gateway for one run, and how to do so persistently and undo it."""
