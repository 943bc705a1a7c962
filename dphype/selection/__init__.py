"""Selection: the public candidates, each client's top-k vote, the server's selection rules on the
release, and the planner that predicts a good pick before anything is spent.
"""
