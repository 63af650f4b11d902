"""What `watchdog run` does beside the job (the CLI process): starts it with the hook injected,
runs an agent and a coordinator by it, and acts on a hang (report, kill, restart) and on signals."""
