"""flashcheck_worker: write a flashcheck external worker in a few lines.

    from flashcheck_worker import Result, Unsupported, serve

    def run(request):
        q, k, v = (request.load(name) for name in "qkv")  # NumPy arrays, storage order
        o, lse = my_attention(q, k, v, request.shape)
        return Result(o=o, lse=lse)

    serve({"dtypes": ["f16"], "masks": ["none"], "lse": True}, run)

The protocol is docs/external-subjects.md in flashcheck's repository. The
package needs only the standard library; NumPy is used when it is installed.
"""
from .npy import Array
from .worker import (BACKWARD_KEYS, CAPABILITY_KEYS, PROTOCOL, PROTOCOLS, Failed, Fatal, Hello, Request, Result,
                     Shape, Timing, Unsupported, Worker, log, serve, write_outputs)

__all__ = ["Array", "BACKWARD_KEYS", "CAPABILITY_KEYS", "PROTOCOL", "PROTOCOLS", "Failed", "Fatal", "Hello", "Request",
           "Result", "Shape", "Timing", "Unsupported", "Worker", "log", "serve", "write_outputs"]
__version__ = "0.1.0"
