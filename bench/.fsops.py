import os, time, sys
d = sys.argv[1]; os.makedirs(d, exist_ok=True); n = 300
def t(f):
    s = time.perf_counter(); f(); return (time.perf_counter() - s) / n * 1e6
def mk():
    for i in range(n): os.mkdir(f"{d}/d{i}")
def rm():
    for i in range(n): os.rmdir(f"{d}/d{i}")
def sl():
    for i in range(n): os.symlink("/x/y", f"{d}/l{i}")
def cr():
    for i in range(n):
        fd = os.open(f"{d}/.t{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644); os.write(fd, b"x" * 1200); os.close(fd); os.rename(f"{d}/.t{i}", f"{d}/f{i}")
print("fs ops (us each): mkdir %.1f rmdir %.1f symlink %.1f create+write+rename %.1f" % (t(mk), t(rm), t(sl), t(cr)))
