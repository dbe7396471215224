import os, time, ctypes
libc=ctypes.CDLL("libc.so.6", use_errno=True)
SYNC_FILE_RANGE_WAIT_BEFORE=1; SYNC_FILE_RANGE_WRITE=2; SYNC_FILE_RANGE_WAIT_AFTER=4
path='target/sfr.dat'
fd=os.open(path, os.O_RDWR|os.O_CREAT|os.O_TRUNC)
os.pwrite(fd, b'\0'*(64<<20), 0); os.fsync(fd)
for SZ in (8<<10, 64<<10):
  buf=os.urandom(SZ)
  for mode in ("plain","sfr-first","plain","sfr-first"):
    a=[];b=[];off=0
    for i in range(400):
        os.pwrite(fd, buf, off)
        t=time.perf_counter()
        if mode=="sfr-first":
            libc.sync_file_range(fd, ctypes.c_longlong(off), ctypes.c_longlong(SZ), SYNC_FILE_RANGE_WRITE|SYNC_FILE_RANGE_WAIT_AFTER)
        t1=time.perf_counter()
        os.fdatasync(fd)
        t2=time.perf_counter()
        a.append((t1-t)*1e6); b.append((t2-t1)*1e6)
        off+=SZ
        if off>(60<<20): off=0
    a.sort(); b.sort()
    print(f"{SZ>>10} KiB {mode}: sfr p50 {a[200]:.0f} fdatasync p50 {b[200]:.0f} p90 {b[360]:.0f}")
