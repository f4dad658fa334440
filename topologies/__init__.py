"""GPU clusters as networkx graphs: a cited hardware catalogue, node and fabric builders."""
