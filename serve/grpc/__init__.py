"""gRPC on the frontend: TorchServe's services, the Open Inference Protocol, health, reflection.

Importing this package turns off gRPC's fork handlers before ``grpc`` loads: the frontend starts
its workers with fork+exec while gRPC's threads run, and the handlers would only log (or crash a
child before its exec); nothing in a worker uses gRPC.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
