import struct, sys
src, dst = sys.argv[1], sys.argv[2]
data = bytearray(open(src, 'rb').read())
# locate .nv_fatbin section via readelf-like parse
import subprocess
out = subprocess.check_output(['readelf', '-SW', src]).decode()
for line in out.splitlines():
    if '.nv_fatbin' in line:
        parts = line.split(']')[1].split()
        off = int(parts[3], 16); size = int(parts[4], 16)
pos, end = off, off + size
kept = zeroed = nfat = 0
archs = {}
while pos < end:
    if struct.unpack_from('<I', data, pos)[0] != 0xBA55ED50:
        pos += 8; continue
    hs = struct.unpack_from('<H', data, pos + 6)[0]
    fs = struct.unpack_from('<Q', data, pos + 8)[0]
    nfat += 1
    e = pos + hs
    while e < pos + hs + fs:
        kind, _, ehs = struct.unpack_from('<HHI', data, e)
        psize = struct.unpack_from('<Q', data, e + 8)[0]
        arch = struct.unpack_from('<I', data, e + 28)[0]
        archs[(kind, arch)] = archs.get((kind, arch), 0) + psize
        if not (kind == 2 and arch == 90):
            data[e + ehs: e + ehs + psize] = bytes(psize); zeroed += psize
        else:
            kept += psize
        e += ehs + psize
    pos += hs + fs
open(dst, 'wb').write(data)
print('fatbins', nfat, 'kept', kept, 'zeroed', zeroed, sorted(archs.items()))
