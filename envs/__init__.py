"""Installed as gyre_env.envs."""
