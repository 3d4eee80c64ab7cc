// The change batch and its values are Tether's own types to its users: `import Tether`
// brings them, as it did before they moved to the leaf module the wire codec shares.
@_exported import TetherBatch
