"""Teacher workers and logits transport (docs/architecture.md §7).

* :class:`TeacherConfig` (``config.py``): model, dtype, device, placement, output kind, transport.
* :class:`TeacherWorker` (``worker.py``): a Hugging Face causal LM scoring batches in micro-batches.
* :class:`TeacherOutput` (``outputs.py``): full logits, top-k + tail mass, or projected log-probs.
* clients (``client.py``): in-process, subprocess (spawn), Ray-actor and served placements, one
  surface; a served teacher (``served.py``) asks an OpenAI-compatible completions server.
* :class:`TeacherPool` (``pool.py``): several teachers at once.
* transports (``transport/``): shared memory, CUDA IPC, Ray object store; persistent slots + acks.
"""

from xdistill.teacher.client import (InProcessClient, RayClient, ServedClient, SubprocessClient,
                                     TeacherClient, make_client)
from xdistill.teacher.config import RayPlacement, ServedPlacement, TeacherConfig
from xdistill.teacher.outputs import LOGP_TINY, TeacherOutput
from xdistill.teacher.pool import TeacherPool, TeacherResults
from xdistill.teacher.transport import TeacherLease
from xdistill.teacher.worker import TeacherInfo, TeacherRequest, TeacherWorker

__all__ = ["TeacherConfig", "RayPlacement", "ServedPlacement", "ServedClient", "TeacherWorker", "TeacherRequest", "TeacherInfo",
           "TeacherOutput", "LOGP_TINY", "TeacherClient", "InProcessClient", "SubprocessClient",
           "RayClient", "make_client", "TeacherPool", "TeacherResults", "TeacherLease"]
