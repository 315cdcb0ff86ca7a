// What a database thread does with the extension bundles (extensions.ts unpacks them). Kept free of
// imports: every database thread loads it.

/** Where the unpacked bundles appear inside every database's PGlite. */
export const EXTENSIONS_MOUNT = "/kiln/extensions";

/** The settings that point PostgreSQL there (besides its own `$system` and `$libdir`). */
export const EXTENSION_CONF = [
  `extension_control_path='$system:${EXTENSIONS_MOUNT}/share/postgresql'`,
  `dynamic_library_path='$libdir:${EXTENSIONS_MOUNT}/lib/postgresql'`,
];

/** What a database thread mounts: the unpacked folder, and files it links into PGlite's own share folder. */
export interface ExtensionFiles {
  dir: string;
  /**
   * Paths under `share/postgresql/` outside the extension folder (unaccent's and dict_xsyn's rules in
   * `tsearch_data`): PostgreSQL reads those only from its own share folder, so each is a symlink there.
   */
  shareLinks: string[];
}

/** The parts of PGlite's Emscripten module the mount uses. */
interface EmscriptenFs {
  FS: {
    mkdirTree(path: string): void;
    mount(type: unknown, opts: { root: string }, mountpoint: string): void;
    symlink(target: string, path: string): void;
  };
  NODEFS: { getMode(path: string): number };
  WASM_PREFIX?: string;
}

/**
 * In a database thread, after PGlite started: mounts the unpacked bundles at EXTENSIONS_MOUNT. The
 * mount is read-only for PostgreSQL (its superuser is the database's client: `COPY ... TO` a module
 * must not change what another database loads): the nodes show no write bits, which the Emscripten
 * file system checks before any write, create, rename or delete. The files on the host keep theirs.
 */
export function mountExtensions(mod: EmscriptenFs, files: ExtensionFiles): void {
  const { FS, NODEFS } = mod;
  const getMode = NODEFS.getMode.bind(NODEFS);
  const root = files.dir;
  NODEFS.getMode = (path: string) => {
    const mode = getMode(path);
    return path === root || path.startsWith(`${root}/`) ? mode & ~0o222 : mode;
  };
  FS.mkdirTree(EXTENSIONS_MOUNT);
  FS.mount(NODEFS, { root }, EXTENSIONS_MOUNT);
  const share = `${mod.WASM_PREFIX ?? "/pglite"}/share/postgresql`;
  for (const rel of files.shareLinks) {
    try {
      FS.symlink(`${EXTENSIONS_MOUNT}/share/postgresql/${rel}`, `${share}/${rel}`);
    } catch {
      // PGlite ships it itself now: its own copy serves
    }
  }
}
