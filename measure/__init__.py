"""The live side of the calculator: runs real ZeRO engines and compares with the prediction."""
