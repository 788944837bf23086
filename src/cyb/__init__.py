"""cyb: language models that pause for breath.

Implements "Catch Your Breath" (CYB): after each real token a causal language model may emit
``<don't know>`` (dk) and take another computation step on a ``<pause>`` input before it answers.
"""

__version__ = "0.1.0"
