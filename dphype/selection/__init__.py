"""Selection: the public candidates, each client's top-k vote, the server's rules and the planner.

The server's selection rules act on the release; the planner predicts a good pick before anything is spent.
"""
