"""Pure torch + transformers side of EagleNest: targets, draft heads, data, training.

Nothing in this package imports from api/, db/ or workers/.
"""
