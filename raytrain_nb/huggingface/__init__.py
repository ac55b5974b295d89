"""Hugging Face integrations, as ``ray.train.huggingface`` names them (``raytrain_nb.huggingface.transformers``)."""
