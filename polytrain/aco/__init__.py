"""ACO-DP: data-parallel ant colony optimisation for the travelling salesman problem."""
