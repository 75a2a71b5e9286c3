"""Built-in rules, one module each, named by RULEBOOK id and slug. The list lives in engine.BUILTIN_RULES."""
