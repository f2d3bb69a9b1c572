"""Remote checkpoint layers: `s3://`, `ssh://` and `hf://` on one shared contract.

`base.RemoteLayer` keeps the checkpoint contract (manifest last, verified uploads, verified
fetches, keep-N); each backend module is a `base.Store` on a well-kept client library: boto3
(`s3`), paramiko (`ssh`) and huggingface_hub (`hf`). `trainguard.agent.layers.open_layer`
picks the backend by URI scheme and imports only the one in use.
"""
