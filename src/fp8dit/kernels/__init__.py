"""Pure ``@triton.jit`` code: no allocation, no torch calls. Launchers live one level up."""
