"""Installed as gyre_env.trainers: training the served Hugging Face model on packed trees
(``hf_tree``, with the CPU tree attention kernel in ``tree_attention``)."""
