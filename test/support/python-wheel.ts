import { execFileSync } from "node:child_process";
import { join } from "node:path";

/**
 * Builds `kilnpkg-1.0-py3-none-any.whl` in `dir`: a one-module pure-Python wheel whose
 * `kilnpkg.VALUE` is `value`, for the local package indexes the build tests serve (pip reaches no
 * public index in the tests). Written by the host's python3 with zipfile, RECORD hashes included.
 */
export function buildKilnpkgWheel(dir: string, value: string): string {
  const wheel = join(dir, "kilnpkg-1.0-py3-none-any.whl");
  execFileSync("python3", [
    "-c",
    `import base64, hashlib, sys, zipfile
files = {"kilnpkg/__init__.py": "VALUE = " + repr(sys.argv[2]) + "\\n",
         "kilnpkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\\nName: kilnpkg\\nVersion: 1.0\\n",
         "kilnpkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: kiln-test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
record = []
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, text in files.items():
        data = text.encode()
        z.writestr(name, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("kilnpkg-1.0.dist-info/RECORD,,")
    z.writestr("kilnpkg-1.0.dist-info/RECORD", "\\n".join(record) + "\\n")`,
    wheel,
    value,
  ]);
  return wheel;
}
