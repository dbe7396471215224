import os, time
path='target/sfr.dat'
fd=os.open(path, os.O_RDWR)
for SZ in (64<<10,):
  buf=os.urandom(SZ)
  for mode in ("plain","rwf_dsync","plain","rwf_dsync"):
    a=[];off=0
    for i in range(400):
        t=time.perf_counter()
        if mode=="plain":
            os.pwrite(fd, buf, off); os.fdatasync(fd)
        else:
            os.pwritev(fd,[buf],off,os.RWF_DSYNC)
        a.append((time.perf_counter()-t)*1e6)
        off+=SZ
        if off>(60<<20): off=0
    a.sort()
    print(f"{SZ>>10} KiB {mode}: p50 {a[200]:.0f} p90 {a[360]:.0f}")
