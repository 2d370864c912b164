"""Markets, reserve prices, rounds, charges, the order book and the operator console.

Keep this file free of Django imports: ``mechanism`` is pure Python and is imported by
code that never configures Django (the SGLang plugin, the simulator).
"""
