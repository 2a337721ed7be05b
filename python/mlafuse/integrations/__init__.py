"""Integrations of mlafuse into other libraries' models (``mlafuse.integrations.transformers``:
Hugging Face transformers). Each imports without its library and fails only when called."""
