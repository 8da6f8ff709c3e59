"""Installed as gyre_env.agents."""
