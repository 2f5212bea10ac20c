"""Reports what the script's environment looks like: stdin, and the mode of a file and folder it makes.

--out DIR: writes DIR/made.txt and DIR/made/ and prints their modes; then reads one line of stdin.
"""

import argparse
import os
import stat

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()
with open(os.path.join(args.out, "made.txt"), "w") as handle:
    handle.write("x")
os.mkdir(os.path.join(args.out, "made"))
print("file", oct(stat.S_IMODE(os.stat(os.path.join(args.out, "made.txt")).st_mode)), flush=True)
print("dir", oct(stat.S_IMODE(os.stat(os.path.join(args.out, "made")).st_mode)), flush=True)
print("read", repr(input()), flush=True)
