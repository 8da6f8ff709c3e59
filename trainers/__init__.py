"""Installed as gyre_env.trainers."""
