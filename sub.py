import zmq, msgpack, sys, time
ctx=zmq.Context()
s=ctx.socket(zmq.SUB); s.connect("ipc:///tmp/evsmoke/ev"); s.setsockopt(zmq.SUBSCRIBE,b"kv-events")
time.sleep(0.3)
sys.path.insert(0,'/work/wt-events/build/python')
import kvcache, numpy as np
with kvcache.Client(socket="/tmp/evsmoke/k.sock") as cl:
    c=cl.open_cache("m", kvcache.Layout(1,2,8,"f32",page_tokens=4))
    k=np.ones((1,10,2,8),np.float32); v=k.copy()
    c.put(1,0,k,v,tokens=list(range(10)))
    c.clear()
    for i in range(3):
        t,seq,p=s.recv_multipart()
        print(t,int.from_bytes(seq,'big'),msgpack.unpackb(p))
